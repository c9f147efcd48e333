# One image for every process of the Procfile / docker-compose.yml.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py alembic.ini ./
COPY jobsapp ./jobsapp
COPY migrations ./migrations
RUN pip install --no-cache-dir . && useradd --create-home jobsapp
USER jobsapp
CMD ["gunicorn", "--bind", "0.0.0.0:8000", "--workers", "2", "jobsapp.web.app:create_app()"]
