from django.urls import path

from examples.django_app.shop import views

urlpatterns = [path("orders/", views.place_order)]
